-- Whether a partition of oncegate_effect_replays past retention must be kept still: an effect of its id range
-- is still stored (its partition of oncegate_effects is kept). One probe of the effects' primary key.
SELECT EXISTS (SELECT FROM oncegate_effects WHERE id >= {{lower}} AND id < {{upper}})

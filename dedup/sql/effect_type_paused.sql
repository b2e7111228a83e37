-- Whether delivery of the type of effect $1 is paused.
SELECT EXISTS (
    SELECT FROM oncegate_effects e JOIN oncegate_paused_types p ON p.type = e.type WHERE e.id = $1
)

-- Whether an effect type is one an operator may name: a gateway seen within the last day delivers it, an
-- effect has it, or it is paused. $1 type
SELECT EXISTS (SELECT FROM oncegate_gateways WHERE $1 = ANY (types))
    OR EXISTS (SELECT FROM oncegate_effects WHERE type = $1)
    OR EXISTS (SELECT FROM oncegate_paused_types WHERE type = $1)

-- Whether an operator paused delivery of effect type $1.
SELECT EXISTS (SELECT FROM oncegate_paused_types WHERE type = $1)

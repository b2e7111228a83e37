-- One effect as an operator sees it in a listing, by id: what a change made of it, read in its transaction.
-- $1 id
SELECT {{columns}} FROM oncegate_effects WHERE id = $1

-- Whether the effect in scope has the status $S as reported (status.sql), or $S is NULL: a filter. A plan made
-- for a known $S (the operator's queries are planned with their parameters) keeps one arm of the OR, which the
-- index on status serves: for delivering, the pending and delivering effects, each then looked up in the outbox.
($S::text IS NULL
 OR $S::text NOT IN ('pending', 'delivering') AND status = $S::text
 OR $S::text = 'pending' AND status = 'pending' AND NOT {{leased}}
 OR $S::text = 'delivering' AND status IN ('pending', 'delivering') AND (status = 'delivering' OR {{leased}}))

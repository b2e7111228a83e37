-- +goose Up

-- Tags and search terms, so that an operator finds a customer's effects by the customer (an on-call engineer
-- paged with "carol got two emails" could search only by a key they did not know). `tags` are the client's
-- own (`tags` in the request body, or the Oncegate-Tags header), kept as sent; `search_terms` are what a
-- search matches: the tags and the provider's recipient-like fields (an email's addresses, and each one's
-- local part), lowercased. NULL when there are none, so that the partial GIN index holds only the effects
-- that can be found that way and costs the others nothing. Adding nullable columns rewrites nothing, and
-- the index over columns all NULL is built at once.
ALTER TABLE oncegate_effects ADD COLUMN tags text[], ADD COLUMN search_terms text[];
CREATE INDEX oncegate_effects_search ON oncegate_effects USING gin (search_terms) WHERE search_terms IS NOT NULL;

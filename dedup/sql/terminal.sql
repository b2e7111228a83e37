-- Which of the effects $1 (ids) are terminal ($2, effect.TerminalStatuses): the gateway's waiting requests,
-- polled together in one statement, so that a wait ends without a notification.
SELECT id FROM oncegate_effects WHERE id = ANY ($1::bigint[]) AND status = ANY ($2::text[])

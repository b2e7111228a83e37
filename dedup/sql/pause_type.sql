-- Pauses delivery of an effect type: dispatchers stop claiming its rows (claim.sql), which wait, uncharged.
-- Pausing a paused type keeps the first pause. Returns whether it was newly paused. $1 type, $2 operator, $3 reason
WITH ins AS (
    INSERT INTO oncegate_paused_types (type, paused_by, reason) VALUES ($1, $2, $3)
    ON CONFLICT (type) DO NOTHING
    RETURNING type
)
SELECT count(*) > 0 FROM ins

-- Drops a detached partition: no longer part of its table, no query waits for it but one reading it by name.
DROP TABLE IF EXISTS {{partition}}

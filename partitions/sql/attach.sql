-- Attaches again a partition detached for retirement in which a row turned out to be still in use (stray.sql):
-- it goes back, unchanged, to serve it. The ATTACH scans it to check its bounds, holding SHARE UPDATE
-- EXCLUSIVE on the parent, which inserts and reads do not wait for.
ALTER TABLE {{parent}} ATTACH PARTITION {{partition}} FOR VALUES FROM ({{lower}}) TO ({{upper}})

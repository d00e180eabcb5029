-- epoch: marks a room with the replication history (the primary's
-- `master_replid`) its state belongs to, and holds the room closed to
-- newcomers for one check-in interval when that history changed: a
-- failover to a replica (or a restart without persistence) may have lost
-- admissions whose visitors still hold valid tickets. While held, no one
-- is admitted (`free_room` is 0), so those sessions are counted again at
-- their check-ins before any newcomer takes their places (docs/failover.md).
-- KEYS[1] the room's meta. ARGV[1] the primary's replication id,
-- ARGV[2] how long to hold (ms), ARGV[3] "1" if this instance saw another
-- replication id before (so a room with no state at all lost it),
-- ARGV[4] the TTL (ms) of a meta this call creates.
-- Returns 1 if the room is now held, else 0.
local meta, epoch = KEYS[1], ARGV[1]
local known = redis.call('HGET', meta, 'epoch')
if known == epoch then
    return 0
end
local exists = known or redis.call('EXISTS', meta) == 1
if not known and ARGV[3] ~= '1' then
    -- A room this history starts (new here), or first marked now.
    if exists then
        redis.call('HSET', meta, 'epoch', epoch)
    end
    return 0
end
-- The hold starts at the room's next decision, on its caller's clock
-- (`counts` in lib/room.lua turns it into `hold_until`).
redis.call('HSET', meta, 'epoch', epoch, 'hold_for', ARGV[2])
if not exists then
    redis.call('PEXPIRE', meta, ARGV[4])
end
return 1

-- reset: empties a room. KEYS = every key of the room, as in the prelude.
-- Its sessions are ended (moved to KEYS[6] with their expiry), so their
-- tickets cannot re-create them at check-in; everything else goes.
redis.call('ZUNIONSTORE', KEYS[6], 2, KEYS[6], KEYS[1], 'AGGREGATE', 'MAX')
local last = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
if #last == 2 then
    -- The record is useless once the last ended session would have expired.
    redis.call('PEXPIREAT', KEYS[6], last[2])
end
return redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])

-- reset: empties a room. KEYS = every key of the room, as in the prelude.
-- ARGV[1] = the first seq a reset room may hand out (the caller's
-- next_seq(now), raised here above the room's last_seq): every queue ticket
-- at or below it is void. Sessions are ended (moved to KEYS[6] with their
-- expiry), so their tickets cannot re-create them at check-in; everything
-- else goes. ARGV[2] = key TTL (ms) for the meta hash that keeps the floor.
redis.call('ZUNIONSTORE', KEYS[6], 2, KEYS[6], KEYS[1], 'AGGREGATE', 'MAX')
local last = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
if #last == 2 then
    -- The record is useless once the last ended session would have expired.
    redis.call('PEXPIREAT', KEYS[6], last[2])
end
local last_seq = tonumber(redis.call('HGET', KEYS[5], 'last_seq') or '0')
local floor = math.max(tonumber(ARGV[1]), last_seq + 1)
-- Region mode: the region's grant totals outlive a reset (the global store
-- counts them; see lua/prelude.lua).
-- So do its admission tokens and the admissions holding them (the rate
-- window): the region may give a token back only once its admission has
-- left the window, reset or not.
-- The tail's ids chunks (KEYS[9] is their prefix; lua/prelude.lua, "The
-- tail"): those between its first and last members' offsets. (A chunk left
-- over by a tail lost before goes with its expiry.)
local ends = { redis.call('ZRANGE', KEYS[8], 0, 0)[1], redis.call('ZRANGE', KEYS[8], -1, -1)[1] }
if ends[1] and #ends[1] == 32 and #ends[2] == 32 then
    local _, _, _, lo = struct.unpack('>dddd', ends[1])
    local _, k, _, hi = struct.unpack('>dddd', ends[2])
    for c = math.floor(lo / 65536), math.min(math.floor((hi + k) / 65536), math.floor(lo / 65536) + 63) do
        redis.call('DEL', KEYS[9] .. ':' .. string.format('%d', c))
    end
end
local grant = redis.call('HMGET', KEYS[5], 'g_raised', 'g_lowered', 'g_arrivals',
    'r_raised', 'r_lowered', 'window', 'admitted')
if grant[4] then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[5], KEYS[7], KEYS[8])
else
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[7], KEYS[8])
end
local f = string.format('%d', floor)
redis.call('HSET', KEYS[5], 'last_seq', f, 'reset_floor', f)
if grant[1] then
    redis.call('HSET', KEYS[5], 'g_raised', grant[1], 'g_lowered', grant[2] or '0',
        'g_arrivals', grant[3] or '0')
end
if grant[4] then
    redis.call('HSET', KEYS[5], 'r_raised', grant[4], 'r_lowered', grant[5] or '0',
        'window', grant[6] or '0', 'admitted', grant[7] or '0')
end
redis.call('PEXPIRE', KEYS[5], ARGV[2])
return 1

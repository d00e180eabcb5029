-- reset: empties a room. ARGV[4] = the first seq a reset room may hand out
-- (the caller's next_seq(now), raised here above the room's last_seq):
-- every queue ticket at or below it is void. Sessions are ended (moved to
-- `ended` with their expiry), so their tickets cannot re-create them at
-- check-in; everything else goes, but for `meta`, which keeps the floor.
redis.call('ZUNIONSTORE', K_ENDED, 2, K_ENDED, K_SESSIONS, 'AGGREGATE', 'MAX')
-- (Batched sessions end the same way; no mark of theirs is there before.)
local batched = batched_sessions()
for first = 1, #batched, 1000 do
    redis.call('ZADD', K_ENDED, 'GT', unpack(batched, first, math.min(first + 999, #batched)))
end
local last = redis.call('ZRANGE', K_ENDED, -1, -1, 'WITHSCORES')
if #last == 2 then
    -- The record is useless once the last ended session would have expired.
    redis.call('PEXPIREAT', K_ENDED, last[2])
end
local last_seq = tonumber(redis.call('HGET', K_META, 'last_seq') or '0')
local floor = math.max(tonumber(ARGV[4]), last_seq + 1)
-- The tail's ids chunks (lua/prelude.lua, "The tail"; one left over by a
-- tail lost before goes with its expiry).
each_tail_chunk(function(key)
    redis.call('DEL', key)
end)
-- Region mode: the region's grant totals outlive a reset (the global store
-- counts them; see lua/prelude.lua).
-- So do its admission tokens and the admissions holding them (the rate
-- window): the region may give a token back only once its admission has
-- left the window, reset or not.
local grant = redis.call('HMGET', K_META, 'g_raised', 'g_lowered', 'g_arrivals',
    'r_raised', 'r_lowered', 'window', 'admitted')
if grant[4] then
    redis.call('DEL', K_SESSIONS, K_BATCHES, K_QUEUE, K_POLLS, K_META, K_PLACES, K_TAIL)
else
    redis.call('DEL', K_SESSIONS, K_BATCHES, K_QUEUE, K_POLLS, K_ADMITS, K_META, K_PLACES, K_TAIL)
end
local f = int(floor)
redis.call('HSET', K_META, 'last_seq', f, 'reset_floor', f)
if grant[1] then
    redis.call('HSET', K_META, 'g_raised', grant[1], 'g_lowered', grant[2] or '0',
        'g_arrivals', grant[3] or '0')
end
if grant[4] then
    redis.call('HSET', K_META, 'r_raised', grant[4], 'r_lowered', grant[5] or '0',
        'window', grant[6] or '0', 'admitted', grant[7] or '0')
end
redis.call('PEXPIRE', K_META, key_ttl_ms)
return 1

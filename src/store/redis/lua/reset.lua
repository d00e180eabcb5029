-- reset: empties a room. ARG_FLOOR = the first seq a reset room may hand out
-- (the caller's next_seq(now), raised here above the room's last_seq):
-- every queue ticket at or below it is void. Sessions are ended (moved to
-- `ended` with their expiry), so their tickets cannot re-create them at
-- check-in; everything else goes, but for `meta`, which keeps the floor.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: batched_sessions, each_tail_chunk, int, lane_key
local k = c.k
redis.call('ZUNIONSTORE', k.ended, 2, k.ended, k.sessions, 'AGGREGATE', 'MAX')
-- (Batched sessions end the same way; no mark of theirs is there before.)
local batched_ended = batched_sessions(c)
for first = 1, #batched_ended, 1000 do
    redis.call('ZADD', k.ended, 'GT', unpack(batched_ended, first, math.min(first + 999, #batched_ended)))
end
local last = redis.call('ZRANGE', k.ended, -1, -1, 'WITHSCORES')
if #last == 2 then
    -- The record is useless once the last ended session would have expired.
    redis.call('PEXPIREAT', k.ended, last[2])
end
local last_seq = tonumber(redis.call('HGET', k.meta, 'last_seq') or '0')
local floor = math.max(tonumber(c.argv[ARG_FLOOR]), last_seq + 1)
-- The tail's ids chunks (lib/tail.lua; one left over by a tail lost
-- before goes with its expiry).
each_tail_chunk(c, function(key)
    redis.call('DEL', key)
end)
-- The lanes (lib/lanes.lua); their turns go with meta.
for lane = 1, MAX_LANES do
    redis.call('DEL', lane_key(c, lane))
end
-- Region mode: the region's grant totals outlive a reset (the global store
-- counts them; see lib/ctx.lua).
-- So do its admission tokens and the admissions holding them (the rate
-- window): the region may give a token back only once its admission has
-- left the window, reset or not.
local grant = redis.call('HMGET', k.meta, 'g_raised', 'g_lowered', 'g_arrivals',
    'r_raised', 'r_lowered', 'window', 'admitted', 'o_rev')
if grant[4] then
    redis.call('DEL', k.sessions, k.batches, k.queue, k.polls, k.meta, k.places, k.tail,
        k.tail_seqs)
else
    redis.call('DEL', k.sessions, k.batches, k.queue, k.polls, k.admits, k.meta, k.places, k.tail,
        k.tail_seqs)
end
local f = int(floor)
redis.call('HSET', k.meta, 'last_seq', f, 'reset_floor', f, 'layout', LAYOUT_VERSION_S)
-- The operators' revision outlives a reset, as their settings do.
if grant[8] then
    redis.call('HSET', k.meta, 'o_rev', grant[8])
end
if grant[1] then
    redis.call('HSET', k.meta, 'g_raised', grant[1], 'g_lowered', grant[2] or '0',
        'g_arrivals', grant[3] or '0')
end
if grant[4] then
    redis.call('HSET', k.meta, 'r_raised', grant[4], 'r_lowered', grant[5] or '0',
        'window', grant[6] or '0', 'admitted', grant[7] or '0')
end
redis.call('PEXPIRE', k.meta, c.p.key_ttl_ms)
return 1

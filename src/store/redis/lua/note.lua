-- note: members of an expiring set (a ZSET member -> until when, in the
-- caller's clock, so tests move time as for every other script).
-- KEYS[1] the set. ARGV[1] now (ms), ARGV[2] until (ms), or '-' to take
-- the members back (`Store::forget`), ARGV[3..] members.
-- Returns {members that were new (taken back: that were there), live
-- members}.
local key = KEYS[1]
local now, until_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local added = 0
if ARGV[2] == '-' then
    if #ARGV > 2 then
        added = redis.call('ZREM', key, unpack(ARGV, 3))
    end
elseif #ARGV > 2 then
    local pairs_nx = {}
    for i = 3, #ARGV do
        pairs_nx[#pairs_nx + 1] = until_ms
        pairs_nx[#pairs_nx + 1] = ARGV[i]
    end
    added = redis.call('ZADD', key, 'NX', unpack(pairs_nx))
    -- Those already there are extended, never shortened.
    redis.call('ZADD', key, 'GT', unpack(pairs_nx))
end
local size = redis.call('ZCARD', key)
local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if last[2] then
    redis.call('PEXPIRE', key, math.max(1, tonumber(last[2]) - now))
end
return {added, size}

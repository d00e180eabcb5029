-- report_add: adds one instance's share of a minute to a room's report
-- (`Reports::report_add`).
-- KEYS[1] the hour's hash (`keys::report`). ARGV[1] now (ms, the caller's
-- clock), ARGV[2] the minute within the hour (0..59), ARGV[3] kept until
-- (ms), ARGV[4] how many sums follow, then that many name/value pairs of
-- sums, then name/value pairs of peaks to the end.
-- Fields: '<m>:k' kept until, '<m>:s:<name>' a sum, '<m>:p:<name>' a peak.
-- Returns 1.
local key = KEYS[1]
local now, until_ms, sums = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
local prefix = ARGV[2] .. ':'
local kept = tonumber(redis.call('HGET', key, prefix .. 'k'))
if kept and kept <= now then
    -- The minute lapsed: it starts over.
    local stale = {}
    for _, field in ipairs(redis.call('HKEYS', key)) do
        if string.sub(field, 1, #prefix) == prefix then
            stale[#stale + 1] = field
        end
    end
    for i = 1, #stale, 1000 do
        redis.call('HDEL', key, unpack(stale, i, math.min(i + 999, #stale)))
    end
    kept = nil
end
if not kept or until_ms > kept then
    redis.call('HSET', key, prefix .. 'k', ARGV[3])
    kept = until_ms
end
local i = 5
for _ = 1, sums do
    redis.call('HINCRBY', key, prefix .. 's:' .. ARGV[i], ARGV[i + 1])
    i = i + 2
end
while i < #ARGV do
    local field = prefix .. 'p:' .. ARGV[i]
    local old = tonumber(redis.call('HGET', key, field))
    if not old or tonumber(ARGV[i + 1]) > old then
        redis.call('HSET', key, field, ARGV[i + 1])
    end
    i = i + 2
end
-- Redis drops the hour on its own once its last minute has lapsed.
local ttl = math.max(1, kept - now)
if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
end
return 1

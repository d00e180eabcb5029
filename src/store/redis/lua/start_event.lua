-- start_event: starts an event's admissions, once per event however many
-- instances ask (see `Store::start_event`).
--
-- ARGV[4] = the event's key (name@start)   ARGV[5] = first prequeue seq
-- ARGV[6] = start seq   ARGV[7] = shuffle (1/0)   ARGV[8] = seed
--
-- With shuffle, the visitors queued with a seq in [ARGV[5], ARGV[6]) get
-- the seqs just below ARGV[5], in a random order: still ahead of everyone
-- who arrives after the start, and recognisably renumbered (meta
-- `stale_lo`/`stale_hi` keep the old range, so the queue description sends
-- tickets that still carry an old seq to the scripts, which hand out the
-- new one). Returns how many visitors were shuffled (0: already started).
local key = ARGV[4]
if redis.call('HGET', K_META, 'event') == key then
    return 0
end
redis.call('HSET', K_META, 'event', key)
redis.call('PEXPIRE', K_META, key_ttl_ms)
if ARGV[7] ~= '1' then
    return 0
end
local lo, hi = tonumber(ARGV[5]), tonumber(ARGV[6])
local members = redis.call('ZRANGEBYSCORE', K_QUEUE, int(lo), '(' .. int(hi))
local n = #members
if n == 0 then
    return 0
end
math.randomseed(tonumber(ARGV[8]))
for i = n, 2, -1 do
    local j = math.random(i)
    members[i], members[j] = members[j], members[i]
end
local first = lo - n
local args = {}
for i = 1, n do
    args[#args + 1] = int(first + i - 1)
    args[#args + 1] = members[i]
    if #args >= 4000 then
        redis.call('ZADD', K_QUEUE, 'XX', unpack(args))
        args = {}
    end
end
if #args > 0 then
    redis.call('ZADD', K_QUEUE, 'XX', unpack(args))
end
redis.call('HSET', K_META, 'stale_lo', int(lo), 'stale_hi', int(hi))
return n

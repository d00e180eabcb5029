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
-- The whole queue is in `queue` for the shuffle (a tail is moved over
-- first: as the shuffle, once per event and as long as the queue).
refill(math.huge)
local entries = redis.call('ZRANGEBYSCORE', K_QUEUE, int(lo), '(' .. int(hi), 'WITHSCORES')
-- Whoever stopped polling leaves now, as at any other time; everyone else's
-- abandonment clock starts again at the start (as in the memory store): a
-- place is seen by its poll record or its seq (`gone_of`), and the shuffle
-- is about to change the seq.
local members = {}
for from = 1, #entries / 2, 2000 do
    local chunk = {}
    for i = from, math.min(from + 1999, #entries / 2) do
        chunk[#chunk + 1] = entries[2 * i - 1]
        chunk[#chunk + 1] = entries[2 * i]
    end
    local gone, keep = gone_of(chunk)
    drop(gone)
    local seen = {}
    for _, visitor in ipairs(keep) do
        members[#members + 1] = visitor
        seen[#seen + 1] = visitor
        seen[#seen + 1] = now_s
    end
    if #seen > 0 then
        redis.call('HSET', K_POLLS, unpack(seen))
    end
end
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

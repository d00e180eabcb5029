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
local k, ARGV = c.k, c.argv
local key = ARGV[4]
if redis.call('HGET', k.meta, 'event') == key then
    return 0
end
redis.call('HSET', k.meta, 'event', key)
redis.call('PEXPIRE', k.meta, c.p.key_ttl_ms)
if ARGV[7] ~= '1' then
    return 0
end
local lo, hi = tonumber(ARGV[5]), tonumber(ARGV[6])
-- The whole queue is in `queue` for the shuffle (a tail is moved over
-- first: as the shuffle, once per event and as long as the queue).
refill(c, math.huge)
local entries = redis.call('ZRANGEBYSCORE', k.queue, int(lo), '(' .. int(hi), 'WITHSCORES')
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
    local gone, keep = gone_of(c, chunk)
    drop(c, gone)
    local seen = {}
    for _, visitor in ipairs(keep) do
        members[#members + 1] = visitor
        seen[#seen + 1] = visitor
        seen[#seen + 1] = c.now_s
    end
    if #seen > 0 then
        redis.call('HSET', k.polls, unpack(seen))
    end
end
local n = #members
if n == 0 then
    return 0
end
-- The shuffle of store::shuffle (so every backend draws the same order):
-- Fisher-Yates over MINSTD, whose products stay below 2^53, exact in doubles.
-- ARGV[8] is the MINSTD state to start from (store::minstd_seed).
local x = tonumber(ARGV[8])
for i = n, 2, -1 do
    x = (x * 48271) % 2147483647
    local j = x % i + 1
    members[i], members[j] = members[j], members[i]
end
-- Just below the prequeue, but above the reset floor (store::shuffled_first).
local floor = tonumber(redis.call('HGET', k.meta, 'reset_floor') or '0')
local first = math.max(lo - n, floor + 1)
local renumbered = {}
for i = 1, n do
    renumbered[#renumbered + 1] = int(first + i - 1)
    renumbered[#renumbered + 1] = members[i]
    if #renumbered >= 4000 then
        redis.call('ZADD', k.queue, 'XX', unpack(renumbered))
        renumbered = {}
    end
end
if #renumbered > 0 then
    redis.call('ZADD', k.queue, 'XX', unpack(renumbered))
end
redis.call('HSET', k.meta, 'stale_lo', int(lo), 'stale_hi', int(hi))
return n

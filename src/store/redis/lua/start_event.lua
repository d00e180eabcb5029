-- start_event: starts an event's admissions, once per event however many
-- instances ask (see `Store::start_event`).
--
-- ARG_EVENT = the event's key (name@start)   ARG_PREQUEUE_SEQ = first
-- prequeue seq   ARG_START_SEQ = start seq   ARG_SHUFFLE = shuffle (1/0)
-- ARG_SEED = seed
--
-- With shuffle, the visitors queued with a seq in [prequeue seq, start
-- seq) get the seqs just below the prequeue seq, in a random order: still ahead of everyone
-- who arrives after the start, and recognisably renumbered (meta
-- `stale_lo`/`stale_hi` keep the old range, so the queue description sends
-- tickets that still carry an old seq to the scripts, which hand out the
-- new one). Returns how many visitors were shuffled (0: already started).
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: drop, gone_of, int, refill
local k, ARGV = c.k, c.argv
local key = ARGV[ARG_EVENT]
if redis.call('HGET', k.meta, 'event') == key then
    return 0
end
redis.call('HSET', k.meta, 'event', key)
redis.call('PEXPIRE', k.meta, c.p.key_ttl_ms)
if ARGV[ARG_SHUFFLE] ~= '1' then
    return 0
end
local lo, hi = tonumber(ARGV[ARG_PREQUEUE_SEQ]), tonumber(ARGV[ARG_START_SEQ])
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
-- ARG_SEED is the MINSTD state to start from (store::minstd_seed).
local x = tonumber(ARGV[ARG_SEED])
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

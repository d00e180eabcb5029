-- region_begin: the start of a region's sync of one room (src/region):
-- takes the region's sync turn and reports what the global store needs.
-- The policy's cap_kind is CAP_GRANT or CAP_RATE_GRANT (region mode).
-- ARG_TURN_MS = how long (ms) this instance holds the turn: the instances
-- of a region share one regional Redis and one of them syncs per interval.
-- ARG_FORCE = 1 to take the turn even if another instance holds it.
-- Returns nil when another instance holds the turn, else {active,
-- g_raised, g_lowered, queued, head seq (0: nobody waits), arrivals since
-- the last sync, admissions in the rate window, r_raised, r_lowered (the
-- admission-token totals), then (rank, seq) pairs sampling the queue}.
-- No promotion here: whom the region may let in depends on the bound the
-- global store is about to send (region_apply promotes).
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: counts, housekeep, int, queue_length, seq_at
local k, ARGV = c.k, c.argv
housekeep(c)
local turn = tonumber(redis.call('HGET', k.meta, 'g_sync_until') or '0')
if ARGV[ARG_FORCE] ~= '1' and turn > c.now then
    return false
end
counts(c)
local g = redis.call('HMGET', k.meta, 'g_raised', 'g_lowered', 'g_arrivals', 'g_arrivals_seen',
    'r_raised', 'r_lowered')
local arrivals = tonumber(g[3] or '0')
local seen = tonumber(g[4] or '0')
if seen > arrivals then
    seen = 0
end
redis.call('HSET', k.meta, 'g_sync_until', int(c.now + tonumber(ARGV[ARG_TURN_MS])),
    'g_arrivals_seen', int(arrivals))
local queued = queue_length(c)
local out = {
    c.active_n,
    tonumber(g[1] or '0'),
    tonumber(g[2] or '0'),
    queued,
    0,
    arrivals - seen,
    c.window_n,
    tonumber(g[5] or '0'),
    tonumber(g[6] or '0'),
}
-- (rank, seq) samples of the queue, from the head to the last place, so
-- the global store can tell how many wait here up to any arrival time.
local SAMPLES = 16
local last_rank = -1
for i = 0, SAMPLES do
    local rank = math.floor(i * (queued - 1) / SAMPLES)
    if queued > 0 and rank > last_rank then
        local seq = seq_at(c, rank)
        if seq then
            out[#out + 1] = rank
            out[#out + 1] = seq
            if rank == 0 then
                out[5] = seq
            end
        end
        last_rank = rank
    end
end
return out

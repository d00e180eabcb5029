-- region_apply: applies what the global store answered to the region's
-- grant (src/region; see lua/lib/ctx.lua for the grant totals).
-- The policy's cap_kind is CAP_GRANT or CAP_RATE_GRANT. ARG_RAISED = the
-- global store's g_raised for this region, ARG_LOWERED = its g_lowered
-- (both only grow; taking the larger of ours and theirs is safe in any
-- order, however late the answer), ARG_TARGET = the target grant (-1:
-- keep), ARG_BOUND = the other regions' oldest waiting seq (0: nobody
-- waits, -1: leave as is), ARG_BOUND_UNTIL = until when (ms) that bound
-- holds. ARG_RATE_RAISED, ARG_RATE_LOWERED, ARG_RATE_TARGET: the same
-- three for the admission tokens (r_raised, r_lowered, target; see
-- lua/lib/ctx.lua),
-- lowered never below the admissions still in the rate window.
-- A raise counts only because the global store granted it first; a lower
-- is made here first (never below the active sessions) and reported after.
-- Returns {g_raised, g_lowered, slots given back now, r_raised, r_lowered,
-- tokens given back now}.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: counts, housekeep, int, promote

-- One grant: ours and the global store's totals taken together (the
-- larger of each), then lowered toward `target` (-1: keep), never below
-- what is `held`. Returns its raised and lowered totals and how much was
-- given back now.
local function settle(our_raised, our_lowered, raised, lowered, target, held)
    raised = math.max(tonumber(our_raised or '0'), tonumber(raised or '0'))
    lowered = math.max(tonumber(our_lowered or '0'), tonumber(lowered or '0'))
    local before = math.max(0, raised - lowered)
    local after = math.max(held, target)
    if target >= 0 and after < before then
        return raised, lowered + before - after, before - after
    end
    return raised, lowered, 0
end

local k, ARGV = c.k, c.argv
housekeep(c)
local g = redis.call('HMGET', k.meta, 'g_raised', 'g_lowered', 'r_raised', 'r_lowered')
counts(c)
local raised, lowered, given =
    settle(g[1], g[2], ARGV[ARG_RAISED], ARGV[ARG_LOWERED], tonumber(ARGV[ARG_TARGET]), c.active_n)
-- A token held by an admission still in the window is not free yet:
-- whoever got it back could admit in a window this admission is in.
local r_raised, r_lowered, r_given =
    settle(g[3], g[4], ARGV[ARG_RATE_RAISED], ARGV[ARG_RATE_LOWERED],
        tonumber(ARGV[ARG_RATE_TARGET] or '-1'), c.window_n)
redis.call('HSET', k.meta, 'g_raised', int(raised), 'g_lowered', int(lowered),
    'r_raised', int(r_raised), 'r_lowered', int(r_lowered))
local bound = tonumber(ARGV[ARG_BOUND])
if bound == 0 then
    redis.call('HDEL', k.meta, 'g_bound', 'g_bound_until')
    c.region_bound = nil
elseif bound > 0 then
    redis.call('HSET', k.meta, 'g_bound', int(bound), 'g_bound_until', ARGV[ARG_BOUND_UNTIL])
    c.region_bound = bound
end
-- Waiting visitors may go in at once with a higher grant or a lifted bound.
c.cap = math.max(0, raised - lowered)
if c.rated then
    c.rate = math.max(0, r_raised - r_lowered)
end
promote(c)
redis.call('PEXPIRE', k.meta, c.p.key_ttl_ms)
return { raised, lowered, given, r_raised, r_lowered, r_given }

-- region_apply: applies what the global store answered to the region's
-- grant (src/region; see lua/prelude.lua for the grant totals).
-- ARGV[2] = 'grant'. ARGV[13] = the global store's g_raised for this
-- region, ARGV[14] = its g_lowered (both only grow; taking the larger of
-- ours and theirs is safe in any order, however late the answer), ARGV[15]
-- = the target grant (-1: keep), ARGV[16] = the other regions' oldest
-- waiting seq (0: nobody waits, -1: leave as is), ARGV[17] = until when
-- (ms) that bound holds. ARGV[18], ARGV[19], ARGV[20]: the same three for
-- the admission tokens (r_raised, r_lowered, target; see lua/prelude.lua),
-- lowered never below the admissions still in the rate window.
-- A raise counts only because the global store granted it first; a lower
-- is made here first (never below the active sessions) and reported after.
-- Returns {g_raised, g_lowered, slots given back now, r_raised, r_lowered,
-- tokens given back now}.
housekeep()
local g = redis.call('HMGET', K_META, 'g_raised', 'g_lowered')
local raised = math.max(tonumber(g[1] or '0'), tonumber(ARGV[13]))
local lowered = math.max(tonumber(g[2] or '0'), tonumber(ARGV[14]))
local target = tonumber(ARGV[15])
counts()
local before = math.max(0, raised - lowered)
local given = 0
if target >= 0 and target < before then
    local after = math.max(active_n, target)
    if after < before then
        given = before - after
        lowered = lowered + given
    end
end
local rg = redis.call('HMGET', K_META, 'r_raised', 'r_lowered')
local r_raised = math.max(tonumber(rg[1] or '0'), tonumber(ARGV[18] or '0'))
local r_lowered = math.max(tonumber(rg[2] or '0'), tonumber(ARGV[19] or '0'))
local r_target = tonumber(ARGV[20] or '-1')
local r_before = math.max(0, r_raised - r_lowered)
local r_given = 0
if r_target >= 0 and r_target < r_before then
    -- A token held by an admission still in the window is not free yet:
    -- whoever got it back could admit in a window this admission is in.
    local after = math.max(window_n, r_target)
    if after < r_before then
        r_given = r_before - after
        r_lowered = r_lowered + r_given
    end
end
redis.call('HSET', K_META, 'g_raised', int(raised), 'g_lowered', int(lowered),
    'r_raised', int(r_raised), 'r_lowered', int(r_lowered))
local bound = tonumber(ARGV[16])
if bound == 0 then
    redis.call('HDEL', K_META, 'g_bound', 'g_bound_until')
    region_bound = nil
elseif bound > 0 then
    redis.call('HSET', K_META, 'g_bound', int(bound), 'g_bound_until', ARGV[17])
    region_bound = bound
end
-- Waiting visitors may go in at once with a higher grant or a lifted bound.
cap = math.max(0, raised - lowered)
if rated then
    rate = math.max(0, r_raised - r_lowered)
end
promote()
redis.call('PEXPIRE', K_META, key_ttl_ms)
return { raised, lowered, given, r_raised, r_lowered, r_given }

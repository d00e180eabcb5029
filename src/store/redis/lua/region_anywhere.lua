-- region_anywhere: a region whose slots are used up asks for slots of the
-- Anywhere pool (the free remainder nobody's grant holds) for new
-- visitors. They are added to the region's grant at once, so the sessions
-- live in the regional store like any other (check-in, renewal, release
-- and expiry stay regional). None are given while another live region has
-- visitors waiting: they arrived first (I3).
-- KEYS[1] = wrg:{room}:regions
-- ARGV: 1 now  2 region  3 limit  4 lease (ms)  5 slots wanted
-- Returns {raised, returned, slots given}.
-- One region's record: "raised returned active queued head traffic at
-- anywhere" (integers but traffic; not JSON, whose numbers keep only 14
-- digits and a head seq has 15).
local FIELDS = { 'raised', 'returned', 'active', 'queued', 'head', 'traffic', 'at', 'anywhere' }
local function decode(text)
    local r, i = {}, 1
    for word in string.gmatch(text, '%S+') do
        if FIELDS[i] then
            r[FIELDS[i]] = tonumber(word) or 0
        end
        i = i + 1
    end
    for _, f in ipairs(FIELDS) do
        r[f] = r[f] or 0
    end
    return r
end
local function encode(r)
    return string.format('%d %d %d %d %d %.3f %d %d', r.raised, r.returned, r.active,
        r.queued, r.head, r.traffic, r.at, r.anywhere)
end

local K = KEYS[1]
local now = tonumber(ARGV[1])
local me_name = ARGV[2]
local limit = tonumber(ARGV[3])
local lease = tonumber(ARGV[4])
local wanted = tonumber(ARGV[5])

local granted = 0
local me
local blocked = false
local raw = redis.call('HGETALL', K)
for i = 1, #raw, 2 do
    local r = decode(raw[i + 1])
    granted = granted + (r.raised or 0) - (r.returned or 0)
    if raw[i] == me_name then
        me = r
    elseif now - (r.at or 0) <= lease and (r.queued or 0) > 0 then
        blocked = true
    end
end
me = me or decode('')
local given = 0
if not blocked then
    given = math.max(0, math.min(wanted, limit - granted))
end
if given > 0 then
    me.raised = (me.raised or 0) + given
    me.anywhere = (me.anywhere or 0) + given
    redis.call('HSET', K, me_name, encode(me))
end
return { me.raised or 0, me.returned or 0, given }

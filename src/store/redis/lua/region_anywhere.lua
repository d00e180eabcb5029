-- region_anywhere: a region whose slots are used up asks for slots of the
-- Anywhere pool (the free remainder nobody's grant holds) for new
-- visitors. They are added to the region's grant at once, so the sessions
-- live in the regional store like any other (check-in, renewal, release
-- and expiry stay regional). The slots another live region's waiting
-- visitors need (its queue at its last report) are kept for them: they
-- arrived first (I3), and their region takes them at its next sync. (The
-- pool was refused outright while any region had anyone waiting: one
-- visitor queued in a small region then queued the big one's newcomers for
-- a whole lease, issue 39.)
-- KEYS[1] = wrg:{room}:regions
-- ARGV (positions: ARG_<NAME>, src/region/global.rs): now, region,
-- limit, lease (ms), wanted (slots), rate (the room's; 0: none)
-- Admission tokens (I2) come with the slots, up to as many, from the
-- tokens no region holds: a newcomer held for want of either asks here.
-- Returns {raised, returned, slots given, rraised, rreturned, tokens given}.
-- Records are decoded and encoded by region_record.lua (in front), which
-- also reads the arguments every global script starts with.

local wanted = tonumber(ARGV[ARG_WANTED])

local rate_limit = tonumber(ARGV[ARG_RATE] or '0')
local granted, rgranted = 0, 0
local me
local waiting = 0
local raw = redis.call('HGETALL', K)
for i = 1, #raw, 2 do
    local r = decode(raw[i + 1])
    granted = granted + (r.raised or 0) - (r.returned or 0)
    rgranted = rgranted + r.rraised - r.rreturned
    if raw[i] == me_name then
        me = r
    elseif now - (r.at or 0) <= lease then
        waiting = waiting + (r.queued or 0)
    end
end
me = me or decode('')
local given = math.max(0, math.min(wanted, limit - granted - waiting))
local rgiven = 0
if rate_limit > 0 then
    rgiven = math.max(0, math.min(wanted, rate_limit - rgranted - waiting))
end
if given > 0 or rgiven > 0 then
    me.raised = me.raised + given
    me.anywhere = me.anywhere + given
    me.rraised = me.rraised + rgiven
    redis.call('HSET', K, me_name, encode(me))
end
return { me.raised, me.returned, given, me.rraised, me.rreturned, rgiven }

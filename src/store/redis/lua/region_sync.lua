-- region_sync: one region reports one room to the global store and
-- receives its grant (src/region). The global store holds, per room, one
-- hash field per region: raised and returned (totals that only
-- grow; the region's grant is raised - returned), and its last report.
--
-- Invariant: the grants sum to at most the limit. A grant is raised here
-- only within the free remainder; lowering happens in the region first,
-- and reaches here as a larger `returned`.
--
-- KEYS[1] = wrg:{room}:regions
-- ARGV (positions: ARG_<NAME>, src/region/global.rs): now (ms), region,
-- limit, lease (ms: a region silent for longer is not live), reserve
-- (permille of the free slots left to the Anywhere pool), active, lowered
-- (the region's g_lowered), queued, head seq (0: nobody waits), arrivals
-- since its last sync, only_lowered ('1': only record `lowered`, the
-- region gave slots back just now), (rank, seq) samples of its queue
-- ("rank:seq,rank:seq"), the room's rate (new_users_per_minute; 0: none),
-- window (admissions in the region's rate window), rate_lowered (its
-- r_lowered: admission tokens given back)
-- Returns {raised, returned, target grant, frontier seq (0: none: every
-- waiting visitor fits), free slots, rraised, rreturned, target rate
-- grant}.

local reserve = tonumber(ARGV[ARG_RESERVE])

local regions = {}
local raw = redis.call('HGETALL', K)
for i = 1, #raw, 2 do
    regions[raw[i]] = decode(raw[i + 1])
end
local me = regions[me_name] or decode('')
regions[me_name] = me
me.returned = math.max(me.returned or 0, tonumber(ARGV[ARG_LOWERED]))
local rate_limit = tonumber(ARGV[ARG_RATE] or '0')
me.rreturned = math.max(me.rreturned, tonumber(ARGV[ARG_RATE_LOWERED] or '0'))
if ARGV[ARG_ONLY_LOWERED] == '1' then
    redis.call('HSET', K, me_name, encode(me))
    return { me.raised, me.returned, 0, 0, 0, me.rraised, me.rreturned, 0 }
end
me.window = tonumber(ARGV[ARG_WINDOW] or '0')
me.active = tonumber(ARGV[ARG_ACTIVE])
me.queued = tonumber(ARGV[ARG_QUEUED])
me.head = tonumber(ARGV[ARG_HEAD])
me.samples = {}
for rank, seq in string.gmatch(ARGV[ARG_SAMPLES] or '', '(%d+):(%d+)') do
    me.samples[#me.samples + 1] = { tonumber(rank), tonumber(seq) }
end
local arrivals = tonumber(ARGV[ARG_ARRIVALS])
if me.at > 0 then
    -- Smoothed over a few intervals, so one quiet second does not strip a
    -- busy region of its share.
    me.traffic = 0.5 * (me.traffic or 0) + 0.5 * arrivals
else
    me.traffic = arrivals
    me.since = now
end
me.recent = arrivals
me.at = now
me.reported = me.anywhere

local function live(r)
    return now - (r.at or 0) <= lease
end

-- Slots in use: a live region's active sessions, and the Anywhere slots
-- it took since it reported them (taken for newcomers, who are in: issue
-- 39, where a region counted at the sessions it had a second ago while it
-- had since drawn 50 slots from the pool let the other region raise its
-- grant by that much and hold it idle); a silent one's whole grant (it
-- may still be admitting within it).
local granted, used = 0, 0
for _, r in pairs(regions) do
    local g = (r.raised or 0) - (r.returned or 0)
    granted = granted + g
    if live(r) then
        local taken = math.max(0, (r.anywhere or 0) - (r.reported or 0))
        r.used = math.min((r.active or 0) + taken, g)
    else
        r.used = g
    end
    r.grant = g
    used = used + r.used
end
local unused = math.max(0, limit - used)

-- Admission tokens in use (I2), the same way: a live region's admissions
-- in its rate window, a silent one's whole rate grant.
local rgranted, rused = 0, 0
for _, r in pairs(regions) do
    local g = r.rraised - r.rreturned
    rgranted = rgranted + g
    if live(r) then
        rused = rused + math.min(r.window, g)
    else
        rused = rused + g
    end
end
local runused = math.max(0, rate_limit - rused)
-- While nobody waits, part of the unused slots stays in the Anywhere pool:
-- `reserve` of them, and never less than POOL_FLOOR_PERMILLE of the limit
-- (all of them when fewer are unused). Slots a region holds serve only its
-- own newcomers, so near full a quiet region's newcomers would queue while
-- a busy one still holds headroom; with the floor, the regions together
-- hold at most what is unused beyond 5 % of the limit, and the last 5 %
-- go to whoever comes first, in one global round trip.
local POOL_FLOOR_PERMILLE = 50
local pool_floor = math.ceil(limit * POOL_FLOOR_PERMILLE / 1000)
local share = math.max(0, math.min(unused - math.floor(unused * reserve / 1000),
    unused - pool_floor))

-- How many wait in region `r` with a seq at most `t`, read from its
-- samples (exact at a sample, linear in between).
local function waiting_upto(r, t)
    local s = r.samples
    if #s == 0 or t < s[1][2] then
        return 0
    end
    for i = 2, #s do
        if t < s[i][2] then
            local r0, s0, r1, s1 = s[i - 1][1], s[i - 1][2], s[i][1], s[i][2]
            return r0 + 1 + math.floor((r1 - r0 - 1) * (t - s0) / (s1 - s0))
        end
    end
    return r.queued
end

-- Waiting visitors first, in arrival order across regions (I3): the
-- global admission frontier is the latest arrival (seq) up to which every
-- region's waiting visitors fit in the free slots. Each region gets the
-- slots for its own visitors up to the frontier and lets in no one beyond
-- it; what is left follows recent traffic. While anyone waits, nothing is
-- kept back for the Anywhere pool (newcomers queue anyway).
local alloc = {}
local names = {}
local queued_total = 0
local lo, hi
for name, r in pairs(regions) do
    if live(r) then
        names[#names + 1] = name
        alloc[name] = 0
        if r.queued > 0 and #r.samples > 0 then
            queued_total = queued_total + r.queued
            local first, last = r.samples[1][2], r.samples[#r.samples][2]
            if not lo or first < lo then
                lo = first
            end
            if not hi or last > hi then
                hi = last
            end
        end
    end
end
local frontier = 0
if queued_total > 0 then
    share = unused
    if limit == 0 then
        -- A room limited only by its rate has no slots to order the queues
        -- by: every waiting visitor counts as fitting (no frontier), so the
        -- tokens below follow each region's queue, as in a capped room
        -- whose rate binds before its capacity. (A frontier on the free
        -- tokens, refreshed once a sync while tokens come back all the
        -- time, held the regions to 80-90 % of the rate.)
        share = queued_total
    end
    if queued_total > share then
        -- The largest seq t with every region's count up to t within the
        -- free slots (at least the oldest waiter, so the queue moves).
        local function total_upto(t)
            local n = 0
            for _, name in ipairs(names) do
                n = n + waiting_upto(regions[name], t)
            end
            return n
        end
        local a, b = lo, hi
        while a < b do
            local mid = a + math.floor((b - a + 1) / 2)
            if total_upto(mid) <= share then
                a = mid
            else
                b = mid - 1
            end
        end
        frontier = a
    end
    for _, name in ipairs(names) do
        local r = regions[name]
        local n = r.queued
        if frontier > 0 then
            n = waiting_upto(r, frontier)
        end
        n = math.min(n, share)
        alloc[name] = n
        share = share - n
    end
end
local total = 0
for _, name in ipairs(names) do
    total = total + (regions[name].traffic or 0)
end
-- Warm-up: for one lease after the global store first heard of the room,
-- a region that has not reported yet cannot be told apart from one that
-- does not exist, so the free slots are not shared out among those that
-- did (the first to report would hold them all for an interval): each
-- region holds one interval of its own arrivals (and one slot) beyond its
-- share of the queue, and the rest stays in the Anywhere pool, which any
-- region reaches in one round trip. A record from before `since` was kept
-- reads 0: an old room, no warm-up.
local born = now
for _, r in pairs(regions) do
    if (r.at or 0) > 0 and r.since < born then
        born = r.since
    end
end
local warming = now - born < lease
-- A region holds at most a few intervals of its recent need beyond its
-- share of the queue: slots a quiet region holds are slots a busy one
-- cannot have until the next sync, while the Anywhere pool serves any.
-- The need is the lesser of the smoothed traffic and the last interval's
-- arrivals, so a region the traffic left gives its slots back at its next
-- sync (to the Anywhere pool) instead of over several. Holding too little
-- costs a newcomer one global round trip; holding too much queues
-- newcomers elsewhere while slots sit unused.
local DEMAND_INTERVALS = 2
local demand_intervals = DEMAND_INTERVALS
if warming then
    demand_intervals = 1
end
-- The slots a region may hold idle for its own newcomers come out of what
-- no other region holds: another region's grant counts in full here, not
-- at its reported sessions. A busy region fills its grant within the
-- interval after it reported (45 newcomers a second against sessions a
-- second old), so counted at its report the quiet region was given a
-- traffic share of slots the busy one was already using, held 6-7 of them
-- idle while the busy region queued at 94 of 100 (issue 39, daemon drill
-- with the split reversed).
local function spare_for(r)
    local free = limit - (granted - r.grant) - r.used
    return math.max(0, math.min(free - math.floor(free * reserve / 1000), free - pool_floor))
end
if share > 0 then
    for _, name in ipairs(names) do
        local r = regions[name]
        local traffic = r.traffic or 0
        local a
        local spare = math.min(share, spare_for(r))
        if total > 0 then
            a = math.floor(spare * traffic / total)
        else
            a = math.floor(spare / #names)
        end
        if total > 0 or warming then
            local need = math.min(traffic, r.recent or 0)
            a = math.min(a, math.ceil(demand_intervals * need) + 1)
        end
        alloc[name] = alloc[name] + a
    end
end
local target = me.active + (alloc[me_name] or 0)

local grant = me.raised - me.returned
if target > grant then
    -- While nobody waits the pool floor stays free of grants too: `unused`
    -- above counts the other regions' active sessions as they last
    -- reported them, and slots they took from the pool since are in their
    -- grants already (issue 39: the busy region's sync took the last slots
    -- of the pool while the quiet one still needed them).
    local room_left = limit - granted
    if queued_total == 0 then
        room_left = room_left - pool_floor
    end
    local add = math.min(target - grant, room_left)
    if add > 0 then
        me.raised = me.raised + add
        granted = granted + add
    end
end

-- Admission tokens (I2): the same arithmetic, where a token is in use
-- while the admission that took it is in the rate window. The unused
-- tokens follow the slots: in proportion to each region's new admissions
-- above (queue share, then traffic), with the same part left to Anywhere
-- while nobody waits.
local rtarget = 0
if rate_limit > 0 then
    local rshare = runused
    if queued_total == 0 then
        rshare = runused - math.floor(runused * reserve / 1000)
    end
    -- While anyone waits, the tokens follow the queues' slots; otherwise
    -- each region's traffic. (The idle slots a region may hold are few
    -- near full, 0 for a quiet one: weighted by those, a quiet region was
    -- left no token of its own, every one of its newcomers needed a token
    -- from the pool, and the pool was empty while the busy region held the
    -- rest: its newcomers queued with slots free, issue 39.)
    local weight, weights = 0, 0
    for _, name in ipairs(names) do
        weights = weights + alloc[name]
    end
    if queued_total > 0 and weights > 0 then
        weight = (alloc[me_name] or 0) / weights
    elseif total > 0 then
        weight = (me.traffic or 0) / total
    elseif #names > 0 then
        weight = 1 / #names
    end
    local give = math.floor(rshare * weight)
    if warming then
        -- As for slots: regions not heard from yet may need the rest.
        local need = math.min(me.traffic or 0, me.recent or 0)
        give = math.min(give, math.ceil(demand_intervals * need) + 1)
    end
    rtarget = me.window + give
    local rgrant = me.rraised - me.rreturned
    if rtarget > rgrant then
        local add = math.min(rtarget - rgrant, rate_limit - rgranted)
        if add > 0 then
            me.rraised = me.rraised + add
        end
    end
end

redis.call('HSET', K, me_name, encode(me))
return { me.raised, me.returned, target, frontier, math.max(0, limit - granted), me.rraised,
    me.rreturned, rtarget }

-- arrive: visitors without a valid ticket arrive, decided one after the
-- other in one atomic run, each exactly as if it had run alone (the
-- daemon gathers concurrent arrivals to a room into one call), each named
-- once (ARGV below). Returns either four integers per visitor,
-- in order:
--   {1, session expiry, 0, 0} | {2, seq, position, length} | {3, reason, 0, 0}
--   | {5, 0, 0, 0} (held, see below)
-- or, for the common case (every visitor new to an open FIFO room), the
-- same verdicts in seven integers whatever the batch size:
--   {0, admitted, session expiry, held, queued, first seq, first position}
-- the first `admitted` visitors admitted, the next `held` held, the rest
-- queued at consecutive seqs and positions (each one's queue length is its
-- position, as it is for one queued alone).
--
-- The decisions read counts kept in locals; the writes are gathered and
-- made once at the end (one command per key), which is most of the saving
-- over one script per visitor.
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: batch_add, count_string, counts, free_room, general_held,
-- uses: housekeep, int, int_next, keep_alive, lane_of, lane_place,
-- uses: next_seq, place_of, promote, queue_length, record_admissions,
-- uses: tail_add, tail_ends, tail_find, tail_place, tail_scan,
-- uses: tail_seqs_add, tail_seqs_of, to_tail, zadd_all
housekeep(c)
counts(c)
-- Whether the sessions, their batches and the window were empty, so that
-- this run (or the promotion just below) creates their keys.
local single_before, batched_before, window_before = c.active_n - c.batched_n, c.batched_n, c.window_n
promote(c)

local waiting = c.queue_n or queue_length(c)
local waiting_before = waiting
local queued_n, rejected_n = 0, 0
-- The sessions' and places' ZADD arguments, in tables kept from call to
-- call (their first `sessions_n` and `places_n` entries are this call's):
-- a table made and grown per call costs more than any one command.
local new_sessions, new_places = ZADD_SESSIONS, ZADD_PLACES
local sessions_n, places_n = 0, 0
local admitted_n = 0
-- Whether this call wrote the tail, and whether it was empty before.
local tailed, tail_was_empty = false, false

local expiry_n = c.now + c.p.session_ms
local expiry_s = int(expiry_n)

-- ARG_FLAGS = the flags, one letter each (wire.rs `ArriveFlags`),
-- ARG_VISITORS.. = the visitors. Flags:
--   ARRIVE_HOLD (region mode): visitors who find no room (and nobody
--       waiting ahead, here or in another region) are answered {5, 0, 0, 0}
--       and left undecided, so the caller can try the Anywhere pool first;
--   ARRIVE_FRESH: every visitor's id was just made for it
--       (VisitorId::random), so none can hold a session or a place and
--       nobody is looked up;
--   ARRIVE_UNSEEN: stable ids the caller has not seen lately (a token's members):
--       looked up in `sessions`, `queue`, the lanes and the tail places
--       noted for stable ids, but the tail itself is not read.
-- Otherwise whether each visitor already holds a session or a place is
-- two commands for the whole call.
local ARGV = c.argv
local flags = ARGV[ARG_FLAGS]
local hold = string.find(flags, ARRIVE_HOLD, 1, true) ~= nil
-- Newcomers do not jump another region's older waiters either.
-- (In a presale window the general queue waits whatever room there is.)
local nobody_ahead = c.region_bound == nil and not general_held(c)
-- Visitor i is ARGV[V + i].
local V = ARG_VISITORS - 1
local n = #ARGV - V
local held_sessions, held_places, held_lanes = {}, {}, {}
local fresh = string.find(flags, ARRIVE_FRESH, 1, true) ~= nil
-- Ids that can arrive again (not just made): their tail places are noted.
local stable = not fresh
-- Only ids just made are admitted in a batch (see "Session batches").
local batch = fresh
-- ARRIVE_UNSEEN: stable ids (a token's member) not seen lately: looked
-- up as above, but no tail member is read unless its place is noted.
local unseen = string.find(flags, ARRIVE_UNSEEN, 1, true) ~= nil
if not fresh then
    held_sessions = redis.call('ZMSCORE', c.k.sessions, unpack(ARGV, V + 1))
    held_places = redis.call('ZMSCORE', c.k.queue, unpack(ARGV, V + 1))
    -- A place in the tail is found by the seq noted for its stable id
    -- (`tail_seqs_of`, one read for the call), checked by `decide`; an id
    -- not noted there (one from before the notes, or put back by a poll)
    -- among the newest TAIL_SCAN members only, unless it is a member not
    -- seen lately ('u'). However long the tail, one call reads a bounded
    -- part of it.
    if tail_ends(c) then
        local ids, at = {}, {}
        for i = 1, n do
            if not held_sessions[i] and not held_places[i] then
                ids[#ids + 1] = ARGV[V + i]
                at[#ids] = i
            end
        end
        if #ids > 0 then
            local noted = tail_seqs_of(c, ids)
            local wanted, any = {}, false
            for j = 1, #ids do
                if noted[j] then
                    held_places[at[j]] = noted[j]
                elseif not unseen then
                    wanted[ids[j]] = at[j]
                    any = true
                end
            end
            if any then
                for visitor, seq in pairs(tail_scan(c, wanted, -TAIL_SCAN)) do
                    held_places[wanted[visitor]] = int(seq)
                end
            end
        end
    end
    -- Or in a priority lane (lanes.lua): that place stands.
    for i = 1, c.p.lanes and n or 0 do
        if not held_sessions[i] and not held_places[i] then
            held_lanes[i] = lane_of(c, ARGV[V + i])
        end
    end
    fresh = true
    for i = 1, n do
        if held_sessions[i] or held_places[i] or held_lanes[i] then
            fresh = false
            break
        end
    end
end

local out
-- The slow path's new seqs, in the order of `new_places`.
local new_seqs

if fresh and c.p.state == 'open' and c.p.method == 'fifo' and c.p.max_queue == 0 then
    -- The common case, decided in two tight loops: newcomers to an open
    -- FIFO room are admitted while there is room and nobody waits (here, or
    -- ahead in another region), and the rest queue in arrival order (or,
    -- with `hold`, are held while nobody waits).
    local admit_n, held_n = 0, 0
    if waiting == 0 and nobody_ahead then
        admit_n = math.max(0, math.min(free_room(c), n))
        if hold then
            held_n = n - admit_n
        end
    end
    if batch then
        if admit_n > 0 then
            batch_add(c, expiry_s, table.concat(ARGV, '', V + 1, V + admit_n), admit_n)
        end
    else
        for i = 1, admit_n do
            new_sessions[2 * i - 1] = expiry_s
            new_sessions[2 * i] = ARGV[V + i]
        end
        sessions_n = 2 * admit_n
    end
    admitted_n = admit_n
    c.active_n = c.active_n + admit_n
    c.window_n = c.window_n + admit_n
    queued_n = n - admit_n - held_n
    local first_seq, first_position = 0, 0
    if queued_n > 0 then
        first_seq, first_position = next_seq(c, queued_n), waiting + 1
        local skip = admit_n + held_n
        if to_tail(c, queued_n) then
            tail_was_empty, tailed = not tail_ends(c), true
            local ids = table.concat(ARGV, '', V + skip + 1, V + skip + queued_n)
            tail_add(c, first_seq, int(first_seq), queued_n, ids, false)
            if stable then
                tail_seqs_add(c, first_seq, queued_n, ids)
            end
        else
            for k = 1, queued_n do
                new_places[2 * k - 1] = int_next(first_seq + k - 1)
                new_places[2 * k] = ARGV[V + skip + k]
            end
            places_n = 2 * queued_n
        end
    end
    out = { 0, admit_n, expiry_n, held_n, queued_n, first_seq, first_position }
else
    -- Any other case, one visitor after the other (these helpers are made
    -- only here: the common case does without them).
    local function room_now()
        return free_room(c) > 0
    end

    local function admit_later(visitor)
        new_sessions[sessions_n + 1] = expiry_s
        new_sessions[sessions_n + 2] = visitor
        sessions_n = sessions_n + 2
        admitted_n = admitted_n + 1
        c.active_n = c.active_n + 1
        c.window_n = c.window_n + 1
        return ADMITTED, expiry_n, 0, 0
    end

    local function decide(i, visitor)
        local expiry = held_sessions[i]
        if expiry then
            return ADMITTED, tonumber(expiry), 0, 0
        end
        if c.p.state == 'closed' then
            rejected_n = rejected_n + 1
            return REJECTED, R_CLOSED, 0, 0
        end
        if held_lanes[i] then
            local place = lane_place(c, held_lanes[i], visitor)
            return place[1], place[2], place[3], place[4]
        end
        if held_places[i] then
            local place = place_of(c, visitor)
            if not place then
                local seq = tonumber(held_places[i])
                local t = tail_find(c, visitor, seq, held_places[i])
                place = t and tail_place(c, t, seq)
            end
            if place then
                return place[1], place[2], place[3], place[4]
            end
        end
        -- passthrough and reject keep no queue of their own, but in paused and
        -- queue_all newcomers wait in line like everyone else.
        if c.p.method == 'passthrough' and c.p.state == 'open' then
            return admit_later(visitor)
        end
        if c.p.method == 'reject' and c.p.state == 'open' then
            if room_now() then
                return admit_later(visitor)
            end
            if hold then
                return HELD, 0, 0, 0
            end
            rejected_n = rejected_n + 1
            return REJECTED, R_OVER_LIMIT, 0, 0
        end
        -- Nobody jumps a queue (I3), and nobody queues while there is room (I4).
        -- The explicit emptiness check matters in states that do not promote.
        if c.p.state == 'open' and waiting == 0 and nobody_ahead then
            if room_now() then
                return admit_later(visitor)
            end
            if hold and c.p.method ~= 'passthrough' then
                return HELD, 0, 0, 0
            end
        end
        if c.p.max_queue > 0 and waiting >= c.p.max_queue then
            rejected_n = rejected_n + 1
            return REJECTED, R_QUEUE_FULL, 0, 0
        end
        -- A new seq is above every seq in the queue: the visitor is last.
        local seq = next_seq(c)
        new_seqs[places_n / 2 + 1] = seq
        new_places[places_n + 1] = int_next(seq)
        new_places[places_n + 2] = visitor
        places_n = places_n + 2
        waiting = waiting + 1
        queued_n = queued_n + 1
        return QUEUED, seq, waiting, waiting
    end

    out = {}
    new_seqs = {}
    for i = 1, n do
        local at = 4 * (i - 1)
        out[at + 1], out[at + 2], out[at + 3], out[at + 4] = decide(i, ARGV[V + i])
    end
end

-- Keys this run may create get their expiry now (`keep_alive`).
local created = {}
if sessions_n > 0 then
    zadd_all(c.k.sessions, new_sessions, sessions_n)
end
if single_before == 0 and c.active_n - c.batched_n > 0 then
    created[#created + 1] = c.k.sessions
end
if batched_before == 0 and c.batched_n > 0 then
    created[#created + 1] = c.k.batches
end
if window_before == 0 and c.window_n > 0 then
    created[#created + 1] = c.k.admits
end
if admitted_n > 0 then
    -- One window member for this call's admissions (counted in `window_n`
    -- as they were made).
    c.window_n = c.window_n - admitted_n
    record_admissions(c, admitted_n)
end
if places_n > 0 and to_tail(c, places_n / 2) then
    -- (The slow path's places are consecutive seqs, written as tail members
    -- run by run.)
    tail_was_empty, tailed = not tail_ends(c), true
    local from = 1
    for i = 1, places_n / 2 do
        local last = i == places_n / 2 or new_seqs[i + 1] ~= new_seqs[i] + 1
        if last then
            local ids = {}
            for j = from, i do
                ids[#ids + 1] = new_places[2 * j]
            end
            local joined = table.concat(ids)
            tail_add(c, new_seqs[from], new_places[2 * from - 1], i - from + 1, joined, false)
            if stable then
                tail_seqs_add(c, new_seqs[from], i - from + 1, joined)
            end
            from = i + 1
        end
    end
    places_n = 0
end
if tailed and tail_was_empty then
    created[#created + 1] = c.k.tail
end
if places_n > 0 or tailed then
    -- A new place needs no poll record: until its first poll, its seq says
    -- when it was last seen (`gone_of`). A queue that starts anew starts
    -- its polls' record, unless it kept one (for a lane's visitors).
    if places_n > 0 then
        zadd_all(c.k.queue, new_places, places_n)
    end
    redis.call('HINCRBY', c.k.meta, 'queued', count_string(queued_n))
    if waiting_before == 0 then
        redis.call('HSETNX', c.k.polls, SINCE, c.now_s)
        created[#created + 1] = c.k.queue
        created[#created + 1] = c.k.polls
    end
end
if c.region_mode then
    -- The region's traffic, which its share of the free slots follows.
    redis.call('HINCRBY', c.k.meta, 'g_arrivals', count_string(n))
end
if rejected_n > 0 then
    redis.call('HINCRBY', c.k.meta, 'rejected', count_string(rejected_n))
end
if c.last_seq ~= c.stored_last_seq then
    -- The last place's seq is the new last_seq, already written out.
    local last_place = places_n > 0 and new_places[places_n - 1]
    redis.call('HSET', c.k.meta, 'last_seq', last_place or int(c.last_seq))
    c.stored_last_seq = c.last_seq
end
keep_alive(c, created)
return out

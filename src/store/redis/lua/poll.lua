-- poll: a queued visitor polls. ARG_VISITOR = visitor, ARG_SEQ = the seq
-- its ticket carries. Returns a verdict like arrive, or {ENDED} when the place
-- was ended (released, used up by an admission, or the room reset since
-- the ticket was issued).
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: admit, counts, enqueue, free_room, general_held, housekeep, int,
-- uses: marked, place_ended, place_of, promote, promotes, save_last_seq,
-- uses: session_of, tail_ends, tail_find, tail_place, touch_poll,
-- uses: used_places
local visitor = c.argv[ARG_VISITOR]
local seq_s = c.argv[ARG_SEQ]
local seq = tonumber(seq_s)

housekeep(c)
promote(c)

-- A place within the free room of a room that promotes: promotion stopped
-- at its bound for this call (PROMOTE_MAX) before reaching it; the caller
-- asks again, so the visitor is admitted at this poll (I4).
-- (FIFO only: a random pick may take anyone; nor past another region's
-- oldest waiter, whom promotion waits for; nor in a presale window, which
-- holds the general queue whatever room there is.)
local function within_room(place)
    if place and promotes(c) and c.p.method == 'fifo' and place[3] <= free_room(c)
        and (not c.region_bound or place[2] <= c.region_bound)
        and not general_held(c) then
        return { MORE }
    end
    return place
end

local function decide()
    -- A place in the tail is found by the ticket's seq: from the tail's
    -- first seq on, a place is there and not in `queue`. One released
    -- there, or admitted in passthrough, is only marked until it moves to
    -- `queue`; a visitor found there has no session otherwise. (Only a
    -- `places` mark says so: an `ended` one is an earlier session's, of a
    -- visitor who came back by id, as a token's member does, to this new
    -- place.)
    local first = tail_ends(c)
    local tail = first and seq >= first.first and tail_find(c, visitor, seq, seq_s)
    local expiry
    if tail then
        if marked(c, c.k.places, visitor) then
            -- Ended there: it waits no more (answered below as any ended place).
            expiry = session_of(c, visitor)
            if expiry then
                return { ADMITTED, expiry }
            end
            tail = nil
        end
    else
        expiry = session_of(c, visitor)
        if expiry then
            return { ADMITTED, expiry }
        end
    end
    local queued = not tail and redis.call('ZSCORE', c.k.queue, visitor)
    local state = c.p.state
    if state == 'closed' then
        if queued or tail then
            -- Keep the place: a room that reopens finds its queue as it was.
            touch_poll(c, visitor)
        end
        return { REJECTED, R_CLOSED }
    end
    local function ended()
        return place_ended(c, visitor, seq)
    end
    if c.p.method == 'passthrough' and state ~= 'paused' then
        -- No limits to wait for: whoever waits in line goes in (an ended
        -- place stays ended, in passthrough too).
        if not queued and not tail and ended() then
            return { ENDED }
        end
        if queued then
            redis.call('ZREM', c.k.queue, visitor)
            redis.call('HDEL', c.k.polls, visitor)
        elseif tail then
            -- Left out when its member moves to `queue` (its session, then
            -- this mark, then its last poll say it left); marked while the
            -- session lasts, since a poll from the tail finds the mark
            -- before the session.
            redis.call('ZADD', c.k.places,
                int(c.now + math.max(c.p.abandon_ms + TAIL_MARK_MS, c.p.session_ms + c.p.grace_ms)),
                visitor)
        end
        -- The place is used up, wherever it was (a lost one too).
        used_places(c, { 0, visitor })
        counts(c)
        return admit(c, visitor)
    end
    if queued then
        touch_poll(c, visitor)
        return within_room(place_of(c, visitor))
    end
    if tail then
        touch_poll(c, visitor)
        return within_room(tail_place(c, tail, seq))
    end
    if ended() then
        return { ENDED }
    end
    -- The store lost the entry (flush, failover, expired keys) but the ticket
    -- still holds the visitor's order: put it back where it was (I5). The
    -- visitor may now be at the head, so promotion runs again.
    enqueue(c, visitor, seq)
    save_last_seq(c)
    promote(c)
    expiry = session_of(c, visitor)
    if expiry then
        return { ADMITTED, expiry }
    end
    tail = tail_find(c, visitor, seq, seq_s)
    if tail then
        return within_room(tail_place(c, tail, seq))
    end
    return within_room(place_of(c, visitor))
end

return decide()

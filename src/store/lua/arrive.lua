-- arrive: a visitor without a valid ticket arrives. ARGV[13] = visitor.
-- Returns a verdict: {1, expiry} | {2, seq, position, length} | {3, reason}.
local visitor = ARGV[13]

housekeep()
promote()

local function decide()
    local expiry = session_of(visitor)
    if expiry then
        return { ADMITTED, expiry }
    end
    if state == 'closed' then
        return reject(R_CLOSED)
    end
    local place = place_of(visitor)
    if place then
        return place
    end
    -- passthrough and reject keep no queue of their own, but in paused and
    -- queue_all newcomers wait in line like everyone else.
    if method == 'passthrough' and state == 'open' then
        return admit(visitor)
    end
    if method == 'reject' and state == 'open' then
        if free_room() > 0 then
            return admit(visitor)
        end
        return reject(R_OVER_LIMIT)
    end
    local waiting = redis.call('ZCARD', K_QUEUE)
    -- Nobody jumps a queue (I3), and nobody queues while there is room (I4).
    -- The explicit emptiness check matters in states that do not promote.
    if state == 'open' and waiting == 0 and free_room() > 0 then
        return admit(visitor)
    end
    if max_queue > 0 and waiting >= max_queue then
        return reject(R_QUEUE_FULL)
    end
    enqueue(visitor, next_seq())
    redis.call('HINCRBY', K_META, 'queued', 1)
    return place_of(visitor)
end

local verdict = decide()
touch()
return verdict

-- stats: live figures, after housekeeping and the periodic maintenance
-- (the daemon calls this every few seconds per room).
-- Returns {active, queued, admitted_last_minute, oldest_admission or -1,
-- then the visitors waiting in each priority lane, lane 1 first}.
-- (`queued` counts the lanes' too.)
--
-- The lib helpers it calls (lua/lib/*.lua; library.rs checks the list):
-- uses: counts, housekeep, lane_key, maintain, promote, queue_length
housekeep(c)
maintain(c)
promote(c)
local oldest = redis.call('ZRANGE', c.k.admits, 0, 0, 'WITHSCORES')
local oldest_ms = -1
if #oldest == 2 then
    oldest_ms = tonumber(oldest[2])
end
counts(c)
local out = { c.active_n, queue_length(c), c.window_n, oldest_ms }
for lane = 1, MAX_LANES do
    local n = redis.call('ZCARD', lane_key(c, lane))
    out[2] = out[2] + n
    out[4 + lane] = n
end
return out

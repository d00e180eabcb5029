-- report_read: a room's report hours as they are kept (`Reports::report_read`).
-- KEYS the hours' hashes (`keys::report`), all in the room's slot.
-- Returns one flat field/value list per key (empty for a missing hour);
-- the caller drops the minutes that lapsed by its clock.
local out = {}
for i, key in ipairs(KEYS) do
    out[i] = redis.call('HGETALL', key)
end
return out

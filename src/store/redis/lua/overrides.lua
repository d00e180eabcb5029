-- overrides: the operator's runtime changes to a room (JSON), or nil.
-- KEYS[1] = the room's overrides key.
return redis.call('GET', KEYS[1])

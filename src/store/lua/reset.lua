-- reset: empties a room. KEYS = every key of the room.
return redis.call('DEL', unpack(KEYS))

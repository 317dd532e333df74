-- Takes orders out of the MES outbox whose stamp is still the one read with their
-- published state (a change written since keeps its stamp until its own publish).
-- KEYS[1] the outbox; ARGV pairs of an order id and that stamp.
-- Returns how many orders left the outbox.
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n

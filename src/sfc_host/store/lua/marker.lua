-- Sent markers, written after the commands were queued, only while the job's state
-- exists (a job deleted meanwhile gets no orphan hash); then the acks of the entries
-- those commands came from, so a marker is never behind its entry's ack.
-- KEYS: the job hashes (one per marker), then the work streams to ack in.
-- ARGV[1] = number of markers, then per marker its field and value
-- ({startedAt}:{commandId}); then the consumer group; then per stream (in KEYS order
-- after the job hashes) the number of ids and the ids.
-- Returns one integer per marker: 1 written, 0 no state.
local n = tonumber(ARGV[1])
local out = {}
for i = 1, n do
  local key = KEYS[i]
  if redis.call('HEXISTS', key, 's') == 1 then
    redis.call('HSET', key, ARGV[2 * i], ARGV[2 * i + 1])
    out[i] = 1
  else
    out[i] = 0
  end
end
local q = 2 * n + 2
local group = ARGV[q]
q = q + 1
for s = n + 1, #KEYS do
  local c = tonumber(ARGV[q])
  for i = q + 1, q + c, 500 do   -- unpack has a limit on how many values
    redis.call('XACK', KEYS[s], group, unpack(ARGV, i, math.min(i + 499, q + c)))
  end
  q = q + 1 + c
end
return out

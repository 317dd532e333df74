-- Sent markers, written after the command was queued, only while the job's state
-- exists (a job deleted meanwhile gets no orphan hash).
-- KEYS: job hashes; ARGV: per key a field and its value ({startedAt}:{commandId}).
-- Returns one integer per key: 1 written, 0 no state.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('HEXISTS', key, 's') == 1 then
    redis.call('HSET', key, ARGV[2 * i - 1], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out

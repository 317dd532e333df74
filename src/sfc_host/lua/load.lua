-- Read many job hashes of one scope in one call, with the server clock.
-- KEYS: job hashes. Returns {now_ms, fields of job 1, fields of job 2, ...}
-- (each an HGETALL list, empty for a job that does not exist).
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
for i, key in ipairs(KEYS) do
  out[i + 1] = redis.call('HGETALL', key)
end
return out

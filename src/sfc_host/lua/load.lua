-- Read many job hashes of one or more scopes in one call, with the server clock and
-- each scope's outage offset.
-- ARGV[1] = n: KEYS[1..n] are the scopes' offset keys, the rest job hashes.
-- Returns {now_ms, offset of scope 1 .. n, fields of job 1, fields of job 2, ...}
-- (each an HGETALL list, empty for a job that does not exist).
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
local n = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if i <= n then
    out[i + 1] = tonumber(redis.call('GET', key) or '0')
  else
    out[i + 1] = redis.call('HGETALL', key)
  end
end
return out

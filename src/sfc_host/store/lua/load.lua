-- Read many job hashes of one or more scopes in one call, with the server clock and
-- each scope's outage offset.
-- ARGV[1] = n: KEYS[1..n] are the scopes' offset keys, the rest job hashes.
-- ARGV[2] = '1': only the fields an event is evolved from (s, v, g, o) and the trace
-- context its commands carry (t), not the archive and the sent markers, whose count
-- grows with the job's history (absent or '0': every field).
-- Returns {now_ms, offset of scope 1 .. n, fields of job 1, fields of job 2, ...}
-- (each a flat field-value list as HGETALL's, empty for a job that does not exist).
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)}
local n = tonumber(ARGV[1])
local lean = ARGV[2] == '1'
local LEAN = {'s', 'v', 'g', 'o', 't'}
for i, key in ipairs(KEYS) do
  if i <= n then
    out[i + 1] = tonumber(redis.call('GET', key) or '0')
  elseif lean then
    local vals = redis.call('HMGET', key, unpack(LEAN))
    local flat = {}
    for j = 1, #LEAN do
      if vals[j] then
        flat[#flat + 1] = LEAN[j]
        flat[#flat + 1] = vals[j]
      end
    end
    out[i + 1] = flat
  else
    out[i + 1] = redis.call('HGETALL', key)
  end
end
return out

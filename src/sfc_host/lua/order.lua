-- Compare-and-set of a job order, and the work entries it implies, in one step.
-- KEYS[1] order hash, KEYS[2] work stream
-- ARGV[1] expected version ('0': the order must not exist), ARGV[2] new order state,
-- ARGV[3] order JSON ('' = keep), ARGV[4] reason ('' = keep), ARGV[5] job id,
-- ARGV[6] n entries, then per entry: kind.
-- Extra fields after the entries: pairs of (field, value) stored on the order too.
-- Returns the new version, or 0 when the expected version did not match.
local current = redis.call('HGET', KEYS[1], 'v') or '0'
if current ~= ARGV[1] then return 0 end
local v = tonumber(current) + 1
redis.call('HSET', KEYS[1], 'v', v, 'state', ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'order', ARGV[3]) end
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'reason', ARGV[4]) end
local ne = tonumber(ARGV[6])
for i = 1, ne do
  redis.call('XADD', KEYS[2], '*', 'k', ARGV[6 + i], 'j', ARGV[5])
end
local q = 7 + ne
while q < #ARGV do
  redis.call('HSET', KEYS[1], ARGV[q], ARGV[q + 1])
  q = q + 2
end
return v

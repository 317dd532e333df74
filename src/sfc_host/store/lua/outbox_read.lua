-- The MES outbox's changed orders, each read with its stamp (sfc_host/store/outbox.py).
-- KEYS[1] the outbox, then each order's hash and job response, in pairs; ARGV the
-- orders' ids. Eight values an order: whether its hash exists, its state, its order
-- JSON, when it ended (empty: never; a Clear leaves it set), its trace context and
-- token (what its status events carry), its job response, its stamp.
local out = {}
for i = 1, #ARGV do
  local h = KEYS[2 * i]
  local f = redis.call('HMGET', h, 'state', 'order', 'ended', 'tp', 'token')
  out[#out + 1] = redis.call('EXISTS', h)
  for j = 1, 5 do out[#out + 1] = f[j] end
  out[#out + 1] = redis.call('GET', KEYS[2 * i + 1])
  out[#out + 1] = redis.call('HGET', KEYS[1], ARGV[i])
end
return out

-- One sweep of a scope: pop the due jobs, queue a tick entry for each, write the
-- scope's heartbeat. If the heartbeat is older than the outage threshold, every job
-- of the index is taken and its tick carries the gap, so all open deadlines move.
-- KEYS[1] due index, KEYS[2] heartbeat, KEYS[3] work stream
-- ARGV[1] limit, ARGV[2] outage threshold (ms), ARGV[3] '1': trim the stream of
-- entries every group has acked (older than each group's oldest pending entry and
-- not newer than what it was delivered last).
-- Returns {now_ms, gap_ms (0 = no outage), jobs queued}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[2]) or '')
local gap = 0
if last ~= nil and now - last > tonumber(ARGV[2]) then gap = now - last end
redis.call('SET', KEYS[2], now)
local jobs
if gap > 0 then
  jobs = redis.call('ZRANGE', KEYS[1], 0, -1)
else
  jobs = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
end
for _, job in ipairs(jobs) do
  redis.call('ZREM', KEYS[1], job)
  if gap > 0 then
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j', job, 'g', gap)
  else
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j', job)
  end
end
if ARGV[3] == '1' then
  local groups = redis.call('XINFO', 'GROUPS', KEYS[3])
  local keep = nil
  for _, g in ipairs(groups) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    local cand
    if tonumber(info['pending']) > 0 then
      cand = redis.call('XPENDING', KEYS[3], info['name'])[2]
    else
      local ms, seq = string.match(info['last-delivered-id'], '^(%d+)-(%d+)$')
      cand = ms .. '-' .. (tonumber(seq) + 1)
    end
    local cms, cseq = string.match(cand, '^(%d+)-(%d+)$')
    cms, cseq = tonumber(cms), tonumber(cseq)
    if keep == nil or cms < keep[1] or (cms == keep[1] and cseq < keep[2]) then
      keep = {cms, cseq}
    end
  end
  if keep ~= nil then
    redis.call('XTRIM', KEYS[3], 'MINID', string.format('%d-%d', keep[1], keep[2]))
  end
end
return {now, gap, #jobs}

-- One sweep of a scope: pop the due jobs, queue tick entries for them (up to ARGV[4]
-- jobs an entry, one per line of field j), write the scope's heartbeat.
-- If the heartbeat is older than the outage threshold, no host swept the scope for that
-- long, and every open deadline must move by the gap instead of expiring: the gap is
-- added to the scope's offset, in O(1) for any number of jobs. Due scores are deadlines
-- minus the offset a job's state has seen, so the index moves with the offset, and each
-- state catches up when it is next read (Store.load, the core's Shift).
-- KEYS[1] due index, KEYS[2] heartbeat, KEYS[3] work stream, KEYS[4] offset
-- ARGV[1] limit, ARGV[2] outage threshold (ms), ARGV[3] '1': trim the stream of
-- entries every group has acked (older than each group's oldest pending entry and
-- not newer than what it was delivered last), ARGV[4] jobs per tick entry.
-- Returns {now_ms, gap_ms (0 = no outage), jobs queued, offset}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = tonumber(redis.call('GET', KEYS[2]) or '')
local gap = 0
if last ~= nil and now - last > tonumber(ARGV[2]) then gap = now - last end
redis.call('SET', KEYS[2], now)
local offset = tonumber(redis.call('GET', KEYS[4]) or '0')
if gap > 0 then offset = redis.call('INCRBY', KEYS[4], gap) end
-- the lowest scores first: exactly ranks 0 .. #due - 1, removed in one call
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - offset, 'LIMIT', 0,
                       tonumber(ARGV[1]))
if #due > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #due - 1)
  local per = tonumber(ARGV[4])
  for i = 1, #due, per do
    redis.call('XADD', KEYS[3], '*', 'k', 'tick', 'j',
               table.concat(due, '\n', i, math.min(i + per - 1, #due)))
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
return {now, gap, #due, offset}

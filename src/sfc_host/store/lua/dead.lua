-- Move one work entry to the dead stream with its reason, and ack it, in one step.
-- KEYS[1] work stream, KEYS[2] dead stream, KEYS[3] failure reasons (hash)
-- ARGV[1] group, ARGV[2] entry id, ARGV[3] reason, ARGV[4] deliveries,
-- ARGV[5..] the entry's fields and values.
local fields = {'id', ARGV[2], 'reason', ARGV[3], 'deliveries', ARGV[4]}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 100000, '*', unpack(fields))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[3], ARGV[2])
return 1

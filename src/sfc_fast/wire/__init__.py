"""The wire codecs, compiled, fenced from the recipe core: ``mqtt5`` (MQTT 5 and 3.1.1
packets) and ``resp`` (Redis requests, on hiredis). Nothing of the recipe core imports
them; the host's MQTT link and Redis channel do."""

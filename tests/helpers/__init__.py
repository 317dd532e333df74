"""What the tests share and are not tests themselves: real servers (``servers``), hosts
in process and as ``sfc-host run`` processes (``hosts``, ``host_proc``), an MQTT station
and a scripted broker, recipes, the async runner (``aio.run``), the repository's folders
(``paths``) and the package plan of docs/architecture.md (``house_plan``).

``tests/conftest.py`` puts ``tests/`` on ``sys.path``, so a test imports them as
``from helpers.servers import RedisServer``; a script outside the tests (benchmarks/)
puts ``tests/`` there itself (``helpers.paths.TESTS``)."""

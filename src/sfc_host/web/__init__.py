"""The operator's web view: every scope, the jobs of a scope, one job's chart live, the
Work Masters, and (when allowed) job control buttons. Server-rendered HTML with one small
script of our own (``static/``), served by aiohttp.

- ``app``: the routes (``WebView.install``) and the job control path
- ``security``: the access token, sessions and CSRF, the response headers
- ``views``: what the pages show, read from Redis
- ``pages``: the HTML, every name escaped
- ``live``: Server-Sent Events for job pages, one poller per job
"""

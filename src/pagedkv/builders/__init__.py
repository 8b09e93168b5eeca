"""Extension grouping rules and builders above the planning core, selected by name
(``config.KV_CACHE_GROUPING_RULES``); the core never imports this package."""

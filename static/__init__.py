"""The browser client served at ``/`` (HTML, CSS, JavaScript: package data only)."""

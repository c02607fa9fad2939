"""Live queue state for the dashboard: changes announced by whichever process
makes them, fanned out to WebSocket viewers by the ASGI process."""

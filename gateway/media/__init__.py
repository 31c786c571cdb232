"""Media: incoming attachments for the model, files and voice sent back (see inbound.py, outbound.py)."""

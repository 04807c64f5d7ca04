"""Monitoring: metric samples, rollups and health events (models come with the monitoring issue)."""

"""Billing: rate cards, hourly usage records and monthly statements (models come with the billing issue)."""

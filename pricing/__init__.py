"""Pricing: rate cards and the price of one unit for one hour.

Owns RateCard and RateCardEntry (tables `billing_ratecard`, `billing_ratecardentry`: they moved here
from billing with their data, content types and permissions, pricing.0001), the derivation rule
from a full-GPU price to MIG, time-slice, MPS and vGPU prices (rates), the card services and the
in-memory PriceBook (services), and the lookup matching ranks offers by (lookup).

Layer: below pools (matching prices its offers) and billing (metering prices hours); above capacity,
whose catalog (products, MIG profiles, vGPU types, spec kinds) a card prices. Imports capacity only
(lint-imports keeps it so); billing's rule that a metered card is never re-derived stays in billing
(billing.services.rederive_card), since only billing can tell.
"""

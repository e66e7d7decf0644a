"""Pricing: what a job costs, before it runs.

    prices     versioned prices per GPU type and partition, and the rate of a GPU mix
               (set_price, list_prices, price_versions, PriceTable, rate_of, rate_for,
               parse_gpus, format_gpus)
    quotes     a job spec's cost beside the account's credit and caps (estimate, quote,
               Estimate)
    routing    on-premise or cloud partitions under a cost limit (route, RoutingConfig,
               CostLimit, PartitionOption, Route)
    cloud_budget  an account's cloud spend this month against its monthly cloud budget
               (cloud_spend, cloud_budget_breach, CloudSpend, CloudBudgetScope)
    snapshot   the in-memory picture job_submit is answered from (Snapshot,
               SnapshotKeeper)

On top of the books (credit) and the limits (a quote names the cap a job would break).
"""

"""Scenario sections → domain objects: the one layer that reads a :class:`~sim.scenario.Scenario`
and builds workloads, engines, fleets and a :class:`~sim.simulation.Simulation` from it. The
families below (``workload``, ``engine``, ``fleet``, ``report``) take plain values and never see
the scenario.
"""

"""Runtime: JIT loading of compiled programs, the OpenMP runtime, and (elsewhere in this
package) caching and the calling convention."""
